"""A large, realistic tool set for one request (issue 34, item 5): the kinds of tools an agent
carries (calendar, mail, files, tickets, payments, shipping, databases, ...), each an OpenAI
function tool with a typed, strict-style JSON schema. ``tool_set(n)`` returns the first ``n``
(cycling with numbered variants past the table, so any size can be asked for).

Each line of ``_TABLE`` is ``name | description | params``; params are ``,``-separated
``name:type`` with ``?`` for optional, types ``str``, ``int``, ``num``, ``bool``, ``date``
(a ``format: date`` string), ``email``, ``[str]`` (array of strings) and ``a|b|c`` (an enum).
"""

from __future__ import annotations

from typing import Any

_TABLE = """\
get_weather | Current weather for a city. | city:str, unit:celsius|fahrenheit
get_forecast | Weather forecast for the next days. | city:str, days:int, unit:celsius|fahrenheit?
search_web | Search the web and return the top results. | query:str, max_results:int?
send_email | Send an e-mail. | to:email, subject:str, body:str, cc:[str]?
list_emails | List e-mails in a mailbox folder. | folder:inbox|sent|archive, unread_only:bool?
create_event | Create a calendar event. | title:str, start:date, end:date, attendees:[str]?
list_events | List calendar events between two dates. | start:date, end:date
cancel_event | Cancel a calendar event. | event_id:str, notify:bool?
book_meeting_room | Book a meeting room. | room:str, date:date, hours:int
create_ticket | Open a support ticket. | title:str, priority:low|medium|high|urgent, body:str
update_ticket | Change a ticket's status. | ticket_id:str, status:open|pending|solved|closed
assign_ticket | Assign a ticket to an agent. | ticket_id:str, agent:str
search_tickets | Search support tickets. | query:str, status:open|pending|solved|closed?
get_order | Look up an order by its number. | order_id:str
cancel_order | Cancel an order. | order_id:str, reason:str?
refund_payment | Refund a payment, fully or partly. | payment_id:str, amount:num, reason:str?
create_invoice | Create an invoice for a customer. | customer_id:str, amount:num, currency:USD|EUR|GBP, due:date
get_exchange_rate | Exchange rate between two currencies. | base:USD|EUR|GBP|JPY, quote:USD|EUR|GBP|JPY
track_shipment | Track a parcel by its tracking number. | tracking_number:str, carrier:ups|fedex|dhl|usps?
create_shipment | Create a shipping label. | address:str, weight_kg:num, service:standard|express
get_customer | Look up a customer record. | customer_id:str
update_customer | Update a customer's contact details. | customer_id:str, email:email?, phone:str?
list_products | List products in a category. | category:str, in_stock:bool?
get_product | Product details by SKU. | sku:str
update_inventory | Set the stock level of a product. | sku:str, quantity:int
run_sql | Run a read-only SQL query. | query:str, database:str
describe_table | Columns and types of a database table. | database:str, table:str
read_file | Read a text file. | path:str
write_file | Write a text file. | path:str, content:str
list_directory | List a directory's entries. | path:str, recursive:bool?
search_code | Search the code base for a pattern. | pattern:str, language:python|typescript|go|rust?
git_commit | Commit staged changes. | message:str
git_diff | Show the diff of a file or the working tree. | path:str?
create_pull_request | Open a pull request. | title:str, branch:str, body:str?
run_tests | Run the test suite or a subset. | target:str?, verbose:bool?
deploy_service | Deploy a service version. | service:str, version:str, environment:staging|production
get_metrics | Read a service metric over a time range. | service:str, metric:str, hours:int
page_oncall | Page the on-call engineer. | service:str, message:str, severity:low|high|critical
translate_text | Translate text to another language. | text:str, target_language:str
summarize_document | Summarize a document. | document_id:str, max_words:int?
get_stock_quote | Latest stock quote. | symbol:str
convert_units | Convert a value between units. | value:num, from_unit:str, to_unit:str
calculate | Evaluate an arithmetic expression. | expression:str
set_reminder | Set a reminder. | text:str, at:date
create_task | Add a task to a to-do list. | title:str, due:date?, tags:[str]?
complete_task | Mark a task done. | task_id:str
get_directions | Directions between two places. | origin:str, destination:str, mode:driving|walking|transit
find_restaurants | Find restaurants near a place. | location:str, cuisine:str?, price:low|medium|high?
book_table | Book a restaurant table. | restaurant_id:str, date:date, party_size:int
search_flights | Search flights between two airports. | origin:str, destination:str, date:date, passengers:int
book_hotel | Book a hotel room. | hotel_id:str, check_in:date, check_out:date, guests:int
get_user_profile | A user's profile. | user_id:str
reset_password | Send a password-reset link. | email:email
add_to_cart | Add a product to the cart. | sku:str, quantity:int
apply_coupon | Apply a coupon to the cart. | code:str
post_message | Post a message to a chat channel. | channel:str, text:str
create_document | Create a document from a title and text. | title:str, text:str, folder:str?
share_document | Share a document with people. | document_id:str, emails:[str], role:viewer|editor
get_time | Current time in a time zone. | timezone:str
lookup_definition | Dictionary definition of a word. | word:str, language:str?
"""

_SIMPLE = {"str": {"type": "string"}, "int": {"type": "integer"}, "num": {"type": "number"},
           "bool": {"type": "boolean"}, "date": {"type": "string", "format": "date"},
           "email": {"type": "string", "format": "email"},
           "[str]": {"type": "array", "items": {"type": "string"}}}


def _param(spec: str) -> tuple[str, dict[str, Any], bool]:
    name, kind = (part.strip() for part in spec.split(":", 1))
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    schema = dict(_SIMPLE[kind]) if kind in _SIMPLE else {"type": "string",
                                                          "enum": kind.split("|")}
    return name, schema, optional


def _tool(line: str, suffix: str = "") -> dict[str, Any]:
    name, description, params = (part.strip() for part in line.split("|", 2))
    props: dict[str, Any] = {}
    required: list[str] = []
    for spec in params.split(", "):
        pname, schema, optional = _param(spec)
        props[pname] = schema
        if not optional:
            required.append(pname)
    return {"type": "function", "function": {
        "name": name + suffix, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required,
                       "additionalProperties": False}}}


LINES = [line for line in _TABLE.splitlines() if line.strip()]


def tool_set(n: int) -> list[dict[str, Any]]:
    """The first ``n`` tools (past the table: ``name_2``, ``name_3``, ... variants)."""
    out = []
    for i in range(n):
        round_, line = divmod(i, len(LINES))
        out.append(_tool(LINES[line], f"_{round_ + 1}" if round_ else ""))
    return out

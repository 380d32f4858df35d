"""A large, realistic tool set for one request (issue 34, item 5): the kinds of tools an agent
carries (calendar, mail, files, tickets, payments, shipping, databases, devops, CRM, HR,
travel, smart home, ...), each an OpenAI function tool with a typed, strict-style JSON schema:
161 distinct tools. ``tool_set(n)`` returns the first ``n`` (cycling with numbered variants past
the table, so any size can be asked for).

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
get_air_quality | Air quality index for a city. | city:str
get_sunrise_sunset | Sunrise and sunset times for a place and date. | location:str, date:date
archive_email | Move an e-mail to the archive. | message_id:str
reply_email | Reply to an e-mail. | message_id:str, body:str, reply_all:bool?
forward_email | Forward an e-mail to someone. | message_id:str, to:email, note:str?
add_contact | Add a contact to the address book. | name:str, email:email, phone:str?
search_contacts | Search the address book. | query:str
reschedule_event | Move a calendar event to new times. | event_id:str, start:date, end:date
find_free_slot | Find a free slot shared by attendees. | attendees:[str], duration_minutes:int, before:date?
add_ticket_comment | Add a comment to a ticket. | ticket_id:str, body:str, internal:bool?
merge_tickets | Merge duplicate tickets into one. | primary_id:str, duplicate_ids:[str]
get_ticket_history | The change history of a ticket. | ticket_id:str
return_order | Start a return for items of an order. | order_id:str, skus:[str], reason:damaged|wrong_item|not_needed
list_orders | List a customer's orders. | customer_id:str, status:pending|shipped|delivered|cancelled?
charge_card | Charge a saved card. | customer_id:str, amount:num, currency:USD|EUR|GBP
list_payments | List payments in a date range. | start:date, end:date, status:succeeded|failed|refunded?
send_invoice_reminder | Remind a customer of an unpaid invoice. | invoice_id:str, message:str?
get_account_balance | Balance of a ledger account. | account_id:str, as_of:date?
transfer_funds | Transfer money between two accounts. | from_account:str, to_account:str, amount:num, memo:str?
schedule_pickup | Schedule a carrier pickup. | address:str, date:date, parcels:int
estimate_shipping | Estimate shipping cost and time. | origin_zip:str, destination_zip:str, weight_kg:num
create_lead | Create a sales lead. | name:str, company:str, email:email, source:web|event|referral|outbound?
update_deal_stage | Move a deal to another pipeline stage. | deal_id:str, stage:qualified|proposal|negotiation|won|lost
log_call | Log a call with a contact. | contact_id:str, summary:str, minutes:int
get_price_history | Price history of a product. | sku:str, days:int
create_discount | Create a discount code. | code:str, percent:int, expires:date?
reorder_stock | Place a purchase order with a supplier. | sku:str, quantity:int, supplier_id:str
explain_query | Show the query plan of a SQL query. | query:str, database:str
create_table | Create a database table from a column list. | database:str, table:str, columns:[str]
backup_database | Start a database backup. | database:str, destination:str
delete_file | Delete a file. | path:str
move_file | Move or rename a file. | source:str, destination:str
file_info | Size and modification time of a file. | path:str
git_log | Recent commits of a branch. | branch:str?, limit:int?
git_checkout | Switch to a branch. | branch:str, create:bool?
review_pull_request | Approve or request changes on a pull request. | pr_number:int, decision:approve|request_changes|comment, body:str?
merge_pull_request | Merge a pull request. | pr_number:int, method:merge|squash|rebase?
run_linter | Run the linter on a path. | path:str, fix:bool?
rollback_deploy | Roll a service back to its previous version. | service:str, environment:staging|production
scale_service | Set the number of replicas of a service. | service:str, replicas:int
get_logs | Recent log lines of a service. | service:str, level:debug|info|warning|error?, lines:int?
create_alert | Create a metric alert. | service:str, metric:str, threshold:num, comparison:above|below
silence_alert | Silence an alert for some hours. | alert_id:str, hours:int, reason:str?
list_incidents | List open incidents. | severity:low|high|critical?
restart_pod | Restart a Kubernetes pod. | namespace:str, pod:str
detect_language | Detect the language of a text. | text:str
spell_check | Check the spelling of a text. | text:str, language:str?
extract_entities | Extract people, places and organizations from a text. | text:str
classify_sentiment | Classify the sentiment of a text. | text:str
get_news | Latest news headlines on a topic. | topic:str, max_results:int?
get_crypto_price | Latest price of a cryptocurrency. | symbol:str, currency:USD|EUR?
get_company_profile | A listed company's profile. | symbol:str
generate_password | Generate a random password. | length:int, symbols:bool?
shorten_url | Shorten a URL. | url:str
create_qr_code | Create a QR code for a text or URL. | content:str, size:int?
start_timer | Start a countdown timer. | minutes:int, label:str?
list_tasks | List tasks of a to-do list. | list:str?, done:bool?
delete_task | Delete a task. | task_id:str
create_note | Create a note. | title:str, body:str, tags:[str]?
search_notes | Search notes. | query:str
get_traffic | Traffic conditions on a route. | origin:str, destination:str
find_parking | Find parking near a place. | location:str, max_price:num?
book_taxi | Book a taxi. | pickup:str, destination:str, at:date?
get_train_times | Train departures between two stations. | origin:str, destination:str, date:date
book_flight | Book a flight found by search. | flight_id:str, passengers:int, seat_class:economy|premium|business
cancel_booking | Cancel a travel booking. | booking_id:str
check_visa | Visa requirements for a trip. | nationality:str, destination_country:str
get_menu | A restaurant's menu. | restaurant_id:str
order_food | Order food for delivery. | restaurant_id:str, items:[str], address:str
update_user_profile | Update a user's profile fields. | user_id:str, display_name:str?, email:email?
deactivate_user | Deactivate a user account. | user_id:str, reason:str?
list_users | List users of a team. | team:str, role:admin|member|guest?
grant_permission | Grant a user a role on a project. | user_id:str, project:str, role:viewer|editor|owner
remove_from_cart | Remove a product from the cart. | sku:str
checkout_cart | Check out the cart. | payment_method:card|paypal|invoice, address:str
list_channels | List chat channels. | include_archived:bool?
create_channel | Create a chat channel. | name:str, private:bool?, members:[str]?
send_direct_message | Send a direct message to a user. | user:str, text:str
upload_file | Upload a local file to shared storage. | path:str, folder:str?
list_documents | List documents in a folder. | folder:str
export_document | Export a document to another format. | document_id:str, format:pdf|docx|markdown
convert_time_zone | Convert a time between time zones. | time:str, from_zone:str, to_zone:str
get_holidays | Public holidays of a country in a year. | country:str, year:int
request_time_off | Request days off. | start:date, end:date, kind:vacation|sick|personal, note:str?
get_payslip | A payslip of a month. | employee_id:str, month:str
submit_expense | Submit an expense for reimbursement. | amount:num, currency:USD|EUR|GBP, category:travel|meals|equipment|other, receipt_url:str?
approve_expense | Approve or reject an expense. | expense_id:str, approve:bool, comment:str?
post_job_opening | Publish a job opening. | title:str, department:str, location:str, remote:bool?
schedule_interview | Schedule an interview with a candidate. | candidate_id:str, interviewer:str, start:date
set_thermostat | Set a thermostat's target temperature. | device_id:str, celsius:num
turn_on_light | Switch a light on or off. | device_id:str, on:bool, brightness:int?
lock_door | Lock or unlock a smart lock. | device_id:str, locked:bool
play_music | Play music by artist, album or playlist. | query:str, shuffle:bool?
create_playlist | Create a playlist. | name:str, tracks:[str]?
log_workout | Log a workout. | kind:run|ride|swim|strength, minutes:int, distance_km:num?
find_doctor | Find doctors by specialty near a place. | specialty:str, location:str
book_appointment | Book an appointment with a provider. | provider_id:str, start:date, reason:str?
enroll_course | Enroll a student in a course. | student_id:str, course_id:str
get_grades | A student's grades for a term. | student_id:str, term:str
search_listings | Search property listings. | city:str, max_price:num?, bedrooms:int?
schedule_viewing | Schedule a property viewing. | listing_id:str, date:date
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

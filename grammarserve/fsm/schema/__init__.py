"""The JSON-Schema front end: a user's schema read, rewritten into what the backends enforce
exactly, checked and closed (``prepare.py`` runs the stages in order; ``fsm/README.md`` maps the
folders)."""

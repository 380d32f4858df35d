"""Reading a schema: older drafts translated, meta-validation, references made local."""

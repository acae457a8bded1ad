"""Config problems with their lines: parsing, validation against a schema, pydantic's errors in words."""

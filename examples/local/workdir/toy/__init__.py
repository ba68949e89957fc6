"""A toy model and its data, sent with the task as part of its working directory."""

"""One module per tool-call format: its markers and the region reader for what follows them."""

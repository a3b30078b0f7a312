"""Region readers shared by several formats: JSON call objects, sequences of them, and bare JSON replies."""

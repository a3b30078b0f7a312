"""Runner subprocess: loads a model and executes tasks."""

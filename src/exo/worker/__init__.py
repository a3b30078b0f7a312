"""The worker: supervises one runner subprocess per loaded model."""

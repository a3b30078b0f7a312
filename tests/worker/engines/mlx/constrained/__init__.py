"""Tests for grammar-constrained tool-call decoding."""

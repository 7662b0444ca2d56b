"""Modal screens: help, confirmations, forms."""

"""The settings: each declared once, parsed once from the environment, refused with one line naming the setting."""

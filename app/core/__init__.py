"""What every part shares and no provider owns: events and effects, and what every signature scheme checks."""

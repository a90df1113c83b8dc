"""A delivery's bytes read: the signature schemes and the event shapes of every provider, assembled; pure, no I/O."""

"""The providers, one module each: its signature scheme, its events' shape and money rules, its API client.
outbound.py gives every call to a provider its total deadline and a slot."""

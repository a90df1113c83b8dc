"""The providers, one module each: its signature scheme, its events' shape and money rules, its API client.

stripe.py, razorpay.py and paypal.py; outbound.py gives every call to a
provider its total deadline and a slot. What they share and no provider owns
is app/core/vocabulary.py's (events) and app/core/signing.py's (signatures); the fetch
step that asks a provider on receipt is app/receiver/fetch.py.
"""

"""What gunicorn's master loads alone, by path: the log format and the worker class."""

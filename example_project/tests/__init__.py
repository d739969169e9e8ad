"""The shop's own tests, written as a user of pikku-celery writes them."""

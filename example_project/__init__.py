"""An online shop's order fulfilment, written as a pikku-celery workflow."""

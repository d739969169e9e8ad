"""The bakery: an order view that starts a workflow, and its Django tests."""

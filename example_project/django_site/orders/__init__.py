"""The example's one app: orders, each fulfilled by the shop's workflow."""

"""The values every layer shares: runs, steps, attempts, and pure rules over them."""

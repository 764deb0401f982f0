"""The Django example's app: orders and the stock they take."""

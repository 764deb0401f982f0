"""The database seam: every face (the daemon, the clients, the CLI's and the HTTP edge's
operator queries, the console, the testing helpers) reaches PostgreSQL through this package.

Here are the connections, pools and engines, the adapters of a caller's own transaction, every
statement, the embedded server, and the kind of each failure (`errors.Failure`), so that no
module outside names a driver's classes.
"""

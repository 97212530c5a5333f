"""The Record store's behaviour as the services use it, run against every backend."""

"""Bundled synthetic tasks that need no download (the quickstart uses ``arithmetic``)."""

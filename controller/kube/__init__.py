"""The controller's API client layer: the write seam (lightkube and the REST client), the
aiohttp/msgspec REST client, resilient watches."""

"""The Configuration admission webhook every controller replica serves: its HTTPS server
(``server``), its own CA and serving certificate (``certs``) and the review of one Configuration
(``review``); its settings are ``controller.settings.WebhookSettings``."""

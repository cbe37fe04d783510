"""The Configuration admission webhook every controller replica serves: its HTTPS server
(``server``), its own CA and serving certificate (``certs``), the review of one Configuration
(``review``) and its flags (``settings``)."""

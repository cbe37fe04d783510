"""Brokers: what should exist for a Configuration and its Instances (pure plans and renders), the
reconcilers that apply the difference, their writes, status, Events and node clean-up."""

"""What every podcost service shares: settings, logs, metrics, traces, HTTP endpoints, and the
runner that starts services and stops them cleanly. Strategies and the core know none of it."""

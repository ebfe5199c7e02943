"""Grafana for gpuflight: `python -m grafana.generate` writes the dashboards and alert rules."""

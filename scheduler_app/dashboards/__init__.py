"""Staff dashboards: Plotly charts of utilisation, JCT, QoS and the queue, and the what-if simulator page."""

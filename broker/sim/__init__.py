"""The backtest: the live core on a simulated clock, cloud and agents, driven by real spot traces."""

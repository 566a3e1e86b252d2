"""Runtime helpers shared by the CLIs: config printing, safe checkpoint loading, run dirs."""

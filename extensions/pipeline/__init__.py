"""The pipeline: which stages of a run are done, and the commands that continue it."""

"""Analysis of pipespec results: closed-form models, simulator, importers, figures (no torch)."""

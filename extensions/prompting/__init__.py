"""What the model is shown: the prompt templates and system prompt, the builder that assembles a
task's prompt with worked examples, and the feedback message built from a verdict."""

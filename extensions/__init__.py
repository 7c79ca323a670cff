"""Library shared by the stage scripts. Importing it has no side effects."""

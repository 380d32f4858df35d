"""What no exact rewrite holds, split off the grammar into run-time value checks."""

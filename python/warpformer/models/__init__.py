"""Python model classes driving the C++ engine (GPT family)."""

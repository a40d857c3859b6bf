"""Optional bridges to other frameworks; each module imports its framework itself."""

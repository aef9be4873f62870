"""The floor every other part of the core stands on: helpers with no Crewlet imports beyond this floor."""

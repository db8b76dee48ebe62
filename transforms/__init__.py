"""Transforms: one interpreter and one rule table per transform."""

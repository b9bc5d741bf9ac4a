"""Rollouts: recorded trajectory groups and their packing into the credit core's batch."""

"""Notifications: who opted in to which job event, one delivery record each, and sending it once."""

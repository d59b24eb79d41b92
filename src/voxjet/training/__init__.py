"""Pieces both training loops share: schedules, metric logs, run configs."""

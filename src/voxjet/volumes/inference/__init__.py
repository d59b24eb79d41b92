"""Prediction: the streamed sliding window, folds, mirroring, the cascade, probabilities, predict
and export."""

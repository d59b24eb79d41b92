"""Predicting what runs will cost before they are submitted: a short profile on one device, a
model of data-parallel communication, and the allocation of a sweep's runs to a GPU budget."""

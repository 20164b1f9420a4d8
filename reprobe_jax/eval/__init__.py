"""Evaluation: step-level metrics (PR-AUC, ROC-AUC, bootstrap intervals; docs/method.md, Metrics), the uncertainty
baselines, results over seeds (bands), the report tables and curves, and the machine each number was measured on."""

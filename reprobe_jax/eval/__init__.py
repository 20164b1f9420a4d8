"""Evaluation.

  metrics    pr_auc, roc_auc, pr_curve, bootstrap_pr_auc: step-level detection metrics, positive = incorrect step,
             equal to scikit-learn's (docs/method.md §A6)
  processbench  score, choose_tau, evaluate: ProcessBench's first-error F1 (the first step scored above a threshold
             chosen on val), beside PR-AUC in reader mode
  baselines  step_scores(name, ...): the uncertainty baselines for one trajectory on the host
  report     scorer_metrics, table_markdown, plot_pr_curves: the PR-AUC table and curves of a set of scorers
  bands      Band, summarise, over_seeds, BandFile, grid_markdown: results over seeds as prediction intervals
  machine    describe(): the machine a number was measured on (CPU, vector ISA, cores, JAX backend)
  notebook   steps_html, show: a trajectory with each step coloured by its score, for the notebooks

Import the modules by their full names (`from reprobe_jax.eval.metrics import pr_auc`): `metrics` sits low, under
the probe and the PRM that report validation PR-AUC, while `baselines` builds on the scorers; the package
re-exports nothing so that importing one does not import the other.
"""

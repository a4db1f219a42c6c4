"""The names of the training objectives (:mod:`shiftbench.erm.methods`), below training.

A run trained here records one of them as its ``method``; a predictions file scored with ``shiftbench eval`` may not
take one (:func:`shiftbench.results.scored_predictions.check_method`), so a method name in the ``results`` view always
means
the same thing. Plain data: the training job imports it.
"""

METHODS = ("erm", "reweight", "groupdro", "irm", "coral", "cdann", "causirl_coral", "causirl_mmd", "mixup", "sagnet")

"""One node's session, room by room: setup, joining, rounds, unmask answers, resuming, results.

``node.runner.NodeRunner`` drives these modules:

* ``setup`` — everything local, checked before any contact (``LocalSetup``);
* ``joining`` — learn the session, save the session key, join, verify the
  roster: the frozen ``SessionContext`` every later step receives;
* ``progress`` — what this node has done in the session (``RoundProgress``);
* ``model_round`` / ``cape_round`` — one kind of round each;
* ``release`` — an egress: budget, bundle, audit record, approval, ledger;
* ``results`` — awaiting a round's aggregate and checking its statements;
* ``unmask_answers`` — answering (or refusing) an unmask request;
* ``resume`` — after a restart, taking in what was aggregated meanwhile;
* ``outputs`` — the node's output folder: old sessions archived, results written.
"""

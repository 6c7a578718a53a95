"""What TRL, verl and later papers add to the paper's math ([P] = arXiv:2512.01374), as pure functions like
``minirl.algo``'s: SAPO (``sapo``), the entropy bonus and high-entropy token selection (``entropy``), verl's
rejection (``rejection``), the KL penalty to a reference (``reference_kl``), GDPO's advantages (``gdpo``) and
the advantage baselines of RLOO, OPO, REINFORCE++ and Pass@k training (``baselines``).
Each is off by default; ``minirl.algo`` itself is the paper's MiniRL and the objectives it compares with.
"""

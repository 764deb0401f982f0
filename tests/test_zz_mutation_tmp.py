import collections
from worker.db import sql
import test_status_machine as m

def test_count(database_url):
    seen = collections.Counter()
    orig = m.JobLifecycle.teardown
    def teardown(self):
        for o, n, c in self.run("SELECT old, new, count(*) FROM chaos_transitions GROUP BY 1, 2"):
            seen[(o, n)] += c
        rules = None
        orig(self)
    m.JobLifecycle.teardown = teardown
    try:
        m.test_random_operations_never_make_an_illegal_transition_or_lose_a_job(database_url)
    finally:
        m.JobLifecycle.teardown = orig
    for k, v in sorted(seen.items(), key=str): print(k, v)

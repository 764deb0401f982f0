import pytest
from worker.db import sql
import test_status_machine as m

@pytest.mark.parametrize("stmt,old,new", [
    ("RECORD_OUTCOMES", "WHERE j.id = r.id AND j.status = 'processing' AND j.worker_id = %(worker_id)s", "WHERE j.id = r.id AND j.worker_id = %(worker_id)s"),
    ("RECORD_OUTCOMES", "AND j.worker_id = %(worker_id)s\n", "\n"),
    ("CANCEL", "WHERE j.id = t.id AND t.status IN ('pending', 'paused', 'processing')", "WHERE j.id = t.id"),
    ("RETRY", "WHERE id = %(id)s AND status IN ('failed', 'cancelled')", "WHERE id = %(id)s"),
    ("RESUME", "WHERE id = %(id)s AND status = 'paused'", "WHERE id = %(id)s"),
    ("RESCUE", "WHERE j.status = 'processing'\n", "WHERE true\n"),
    ("RELEASE", "WHERE status = 'processing' AND", "WHERE"),
])
def test_mutant(database_url, monkeypatch, stmt, old, new):
    text = getattr(sql, stmt)
    assert old in text
    monkeypatch.setattr(sql, stmt, text.replace(old, new))
    with pytest.raises(AssertionError) as e:
        m.test_random_operations_never_make_an_illegal_transition_or_lose_a_job(database_url)
    print("\nCAUGHT", stmt, "->", str(e.value).splitlines()[0][:150])

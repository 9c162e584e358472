//! What a plan says about itself, whatever planned it: a planner panic
//! fails only its statement, and which plans a shard group's cut-over must
//! hold back.

use crate::error::sqlstate;
use crate::planner::router::router;
use crate::planner::{contain_panics, rewrite, Command, Plan, ShardTarget};
use pg_query::protobuf;

#[test]
fn a_panicking_planner_fails_only_its_statement() {
    let plan = contain_panics(|| panic!("node kind {} not handled", 7));
    let Plan::Unsupported(e) = plan else { panic!("expected an error plan, got {plan:?}") };
    assert_eq!(e.code(), sqlstate::INTERNAL_ERROR);
    assert!(e.message().contains("node kind 7 not handled"), "{}", e.message());
}

/// A shard group's cut-over holds back statements run whole on a worker,
/// whatever they were routed by: their user code may write it.
#[test]
fn a_statement_whole_on_a_worker_may_write_any_colocation() {
    let template = || rewrite::ShardTemplate::unchanged(0, protobuf::RawStmt::default());
    let anywhere = router(Command::WholeOnWorker, ShardTarget::AnyNode(vec![1, 2]), None, template());
    assert!(anywhere.may_write_colocation(7));
    let reference_read = router(Command::Select, ShardTarget::Reference, None, template());
    assert!(!reference_read.may_write_colocation(7));
}

use super::super::deployment::tests::deployment;
use super::*;

#[test]
fn adoption_and_a_deployment_not_labelled_governed_are_read_afresh() {
    let mut governed = deployment();
    governed.metadata.labels = Some(
        [(
            crate::controller::rollout_strategy::gate::GOVERNED_LABEL.to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let other = deployment();
    let adopted = RolloutStrategyStatus {
        stable_revision: Some("r1".into()),
        ..Default::default()
    };
    let seen = |d: &Deployment| Observed {
        deployment: Some(DeploymentView::from_parts(d, &[])),
        ..Default::default()
    };
    assert!(!needs_fresh_target(&adopted, &seen(&governed)));
    assert!(needs_fresh_target(&adopted, &seen(&other)));
    assert!(needs_fresh_target(
        &RolloutStrategyStatus::default(),
        &seen(&governed)
    ));
    // Not in the cache: not labelled governed yet, or not there; only a GET tells.
    assert!(needs_fresh_target(&adopted, &Observed::default()));
}

#[test]
fn a_missing_target_is_looked_for_less_and_less_often_and_at_once_once_found() {
    use crate::api::Gate;
    let looks = Looks::default();
    assert_eq!(
        looks.wait("shop/web", Gate::Admission),
        Duration::ZERO,
        "never looked: now"
    );
    looks.looked("shop/web", false, Gate::Admission);
    let w = looks.wait("shop/web", Gate::Admission);
    assert!(
        w > FIRST_LOOK - Duration::from_secs(1) && w <= FIRST_LOOK,
        "{w:?}"
    );
    looks.looked("shop/web", false, Gate::Admission);
    assert!(
        looks.wait("shop/web", Gate::Admission) > FIRST_LOOK,
        "twice as long"
    );
    for _ in 0..10 {
        looks.looked("shop/web", false, Gate::Admission);
    }
    assert!(
        looks.wait("shop/web", Gate::Admission) <= LAST_LOOK,
        "never longer than LAST_LOOK"
    );
    assert!(looks.wait("shop/web", Gate::Admission) > LAST_LOOK - Duration::from_secs(1));
    assert_eq!(
        looks.wait("shop/api", Gate::Admission),
        Duration::ZERO,
        "per strategy"
    );
    // Found: should the cache lose it again, the next look is at once, and starts over.
    looks.looked("shop/web", true, Gate::Admission);
    assert_eq!(looks.wait("shop/web", Gate::Admission), Duration::ZERO);
    looks.looked("shop/web", false, Gate::Admission);
    assert!(looks.wait("shop/web", Gate::Admission) <= FIRST_LOOK);
    looks.forget("shop/web");
    assert_eq!(looks.wait("shop/web", Gate::Admission), Duration::ZERO);
    // Paused at rest, no gate labels a new Deployment: the looks stay FIRST_LOOK apart.
    for _ in 0..5 {
        looks.looked("shop/late", false, Gate::PauseAtRest);
    }
    assert!(looks.wait("shop/late", Gate::PauseAtRest) <= FIRST_LOOK);
    // The gate comes back: the looks grow again from there (20 s), not from the count.
    looks.looked("shop/late", false, Gate::Admission);
    let w = looks.wait("shop/late", Gate::Admission);
    assert!(w > FIRST_LOOK && w <= 2 * FIRST_LOOK, "{w:?}");
    // The gate goes away: a long wait set under it is cut to FIRST_LOOK.
    for _ in 0..5 {
        looks.looked("shop/long", false, Gate::Admission);
    }
    assert!(looks.wait("shop/long", Gate::Admission) > 10 * FIRST_LOOK);
    let w = looks.wait("shop/long", Gate::PauseAtRest);
    assert!(
        w > FIRST_LOOK - Duration::from_secs(1) && w <= FIRST_LOOK,
        "{w:?}"
    );
}

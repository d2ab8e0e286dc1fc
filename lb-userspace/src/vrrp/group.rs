//! Instances that move together (`group = "<name>"` on `[[vrrp]]`, keepalived's
//! `vrrp_sync_group`), as a pure function of the members' own tracking and states.
//!
//! The supervisor feeds each instance a [`Tracking`] (weight and FAULT); a group changes what
//! it feeds so that its members are held by one node:
//!
//! - FAULT spreads: a member in FAULT for a cause of its own (a failing weight-0 check, its
//!   link down) puts every member in FAULT, so all of them leave the node together.
//! - One weight: every member gets the lowest of the members' tracked weights, so the
//!   elections of the members (same priority, same peers) rank the nodes the same way.
//! - The first member in config order leads: another member may not be master while the
//!   leader is a backup of another node (it resigns, as keepalived moves a sync group's
//!   members to BACKUP), and while the leader is not master the others run at priority 1, so
//!   they never preempt on their own and take over once the leader has. Without a leader two
//!   nodes could each keep one member (e.g. the IPv4 tie broken one way, the IPv6 tie the
//!   other), and a rule that any member's BACKUP demotes the others would have both nodes
//!   demote each other's masters forever.

use std::net::IpAddr;

use super::{state::State, track::Tracking};

/// Pushed to a follower while its leader is not master: effective priority 1 (see
/// [`super::state::effective_priority`]), below any configured priority.
pub const FOLLOWER_WEIGHT: i32 = -255;

/// One instance as the supervisor sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member<'a> {
    pub group: Option<&'a str>,
    /// What its own tracked checks add up to.
    pub own: Tracking,
    pub state: State,
    /// Its current master (ourselves when master).
    pub master: Option<IpAddr>,
    /// Its own advert source: a master other than this is another node.
    pub primary: IpAddr,
    /// Whether the tracking last pushed to it held it in FAULT: a FAULT we pushed is not a
    /// cause of its own.
    pub pushed_fault: bool,
    /// Its last transition left MASTER (it lost an election or resigned): its master is
    /// another node even before it has heard which.
    pub left_master: bool,
}

impl Member<'_> {
    fn own_fault(&self) -> bool {
        self.own.fault || (self.state == State::Fault && !self.pushed_fault)
    }

    /// A backup of another node (not merely a backup that has heard no master yet).
    fn backup_of_another(&self) -> bool {
        self.state == State::Backup
            && (self.left_master || self.master.is_some_and(|m| m != self.primary))
    }
}

/// The tracking to push to each member, in the order of `members`. Members without a group
/// get their own tracking.
pub fn group_tracking(members: &[Member]) -> Vec<Tracking> {
    members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Some(g) = m.group else {
                return m.own;
            };
            let group: Vec<(usize, &Member)> = members
                .iter()
                .enumerate()
                .filter(|(_, o)| o.group == Some(g))
                .collect();
            let weight = group.iter().map(|(_, o)| o.own.weight).min().unwrap_or(0);
            let fault = group.iter().any(|(_, o)| o.own_fault());
            let (leader_at, leader) = group[0];
            if leader_at == i {
                return Tracking { weight, fault };
            }
            // A follower that is master while the leader serves another node steps down
            // (FAULT resigns with priority 0, so the other node's member takes over at once;
            // the next pass lets it back to BACKUP).
            let demote = m.state == State::Master && leader.backup_of_another();
            let weight = if leader.state == State::Master {
                weight
            } else {
                FOLLOWER_WEIGHT
            };
            Tracking {
                weight,
                fault: fault || demote,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "192.0.2.1";
    const PEER: &str = "192.0.2.2";

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn m<'a>(group: Option<&'a str>, state: State, master: Option<&str>) -> Member<'a> {
        Member {
            group,
            own: Tracking {
                weight: 28,
                fault: false,
            },
            state,
            master: master.map(ip),
            primary: ip(ME),
            pushed_fault: false,
            left_master: false,
        }
    }

    fn t(weight: i32, fault: bool) -> Tracking {
        Tracking { weight, fault }
    }

    #[test]
    fn ungrouped_instances_keep_their_own_tracking() {
        let mut a = m(None, State::Master, Some(ME));
        a.own = t(-20, true);
        let b = m(None, State::Backup, Some(PEER));
        assert_eq!(group_tracking(&[a, b]), vec![t(-20, true), t(28, false)]);
    }

    #[test]
    fn a_members_failing_fault_check_faults_the_whole_group_only() {
        let g = Some("api");
        let lead = m(g, State::Master, Some(ME));
        let mut follower = m(g, State::Master, Some(ME));
        follower.own = t(28, true);
        let other = m(Some("ingress"), State::Master, Some(ME));
        assert_eq!(
            group_tracking(&[lead, follower, other]),
            vec![t(28, true), t(28, true), t(28, false)]
        );
    }

    #[test]
    fn a_members_own_fault_state_spreads_but_a_pushed_one_does_not_stick() {
        let g = Some("api");
        // The follower's link is down: FAULT that nobody pushed.
        let lead = m(g, State::Master, Some(ME));
        let follower = m(g, State::Fault, None);
        assert!(group_tracking(&[lead.clone(), follower.clone()])[0].fault);
        // Once both are in the FAULT we pushed and the cause is gone, both come back.
        let mut lead = m(g, State::Fault, None);
        lead.pushed_fault = true;
        let mut follower = follower;
        follower.pushed_fault = true;
        let out = group_tracking(&[lead, follower]);
        assert!(!out[0].fault && !out[1].fault, "{out:?}");
    }

    #[test]
    fn members_share_the_lowest_weight() {
        let g = Some("api");
        let lead = m(g, State::Master, Some(ME));
        let mut follower = m(g, State::Master, Some(ME));
        follower.own = t(8, false);
        assert_eq!(
            group_tracking(&[lead, follower]),
            vec![t(8, false), t(8, false)]
        );
    }

    #[test]
    fn a_follower_resigns_while_its_leader_serves_another_node() {
        let g = Some("api");
        let lead = m(g, State::Backup, Some(PEER));
        let follower = m(g, State::Master, Some(ME));
        let out = group_tracking(&[lead.clone(), follower]);
        assert_eq!(out[0], t(28, false));
        assert!(out[1].fault);
        // Once it left, it waits as a backup at priority 1.
        let follower = m(g, State::Fault, None);
        let mut follower = follower;
        follower.pushed_fault = true;
        assert_eq!(
            group_tracking(&[lead, follower])[1],
            t(FOLLOWER_WEIGHT, false)
        );
    }

    #[test]
    fn a_follower_resigns_as_soon_as_its_leader_left_master() {
        // The leader just lost an election: the daemon may not know the new master yet.
        let g = Some("api");
        let mut lead = m(g, State::Backup, Some(ME));
        lead.left_master = true;
        let follower = m(g, State::Master, Some(ME));
        assert!(group_tracking(&[lead, follower])[1].fault);
    }

    #[test]
    fn followers_do_not_preempt_before_the_leader_and_follow_it_when_master() {
        let g = Some("api");
        // Start: nobody master yet; a follower that wins a race is not demoted (its leader
        // has heard no master), but it waits at priority 1.
        let lead = m(g, State::Backup, None);
        let follower = m(g, State::Master, Some(ME));
        assert_eq!(
            group_tracking(&[lead, follower])[1],
            t(FOLLOWER_WEIGHT, false)
        );
        // The leader master: followers get the group's weight and may preempt.
        let lead = m(g, State::Master, Some(ME));
        let follower = m(g, State::Backup, Some(PEER));
        assert_eq!(group_tracking(&[lead, follower])[1], t(28, false));
    }

    #[test]
    fn the_first_member_in_order_leads() {
        let g = Some("api");
        // Order matters: with the follower first, it leads.
        let a = m(g, State::Master, Some(ME));
        let b = m(g, State::Backup, Some(PEER));
        let out = group_tracking(&[b.clone(), a.clone()]);
        assert!(out[1].fault, "{out:?}");
        let out = group_tracking(&[a, b]);
        assert!(!out[0].fault && !out[1].fault, "{out:?}");
    }
}

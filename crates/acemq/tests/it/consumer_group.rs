//! Consumer groups, on `memory://` and RabbitMQ: scaled up and down under load, every
//! message is handled exactly once (nothing lost, nothing handled twice); the prefetch
//! changed while it runs; depth per member; a pipeline step scaled while it runs.

use crate::support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use acemq::Connection;
use acemq::consume::{ConsumerOptions, Message};
use support::{Broker, eventually, on_each_target};

const WAIT: Duration = Duration::from_secs(60);
const MESSAGES: u32 = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_up_and_down_under_load_loses_and_doubles_nothing() {
    on_each_target(|target: Broker| async move {
        let (mq, q) = support::connect_with_classic_queue(&target, "group").await;
        let handled: Arc<Mutex<HashMap<u32, u32>>> = Arc::default();
        let h = handled.clone();
        let group = mq
            .consume_group(
                &q,
                1,
                ConsumerOptions::default().prefetch(20).concurrency(2),
                move |m: Message<u32>| {
                    let h = h.clone();
                    async move {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        *h.lock().unwrap().entry(*m.payload()).or_default() += 1;
                        Ok(())
                    }
                },
            )
            .await
            .unwrap();
        let publisher = mq.publisher::<u32>("", &q);
        let seen = |n: usize| {
            let handled = handled.clone();
            async move {
                eventually(WAIT, &format!("{n} handled"), || async {
                    (handled.lock().unwrap().len() >= n).then_some(())
                })
                .await
            }
        };
        let sender = tokio::spawn(async move {
            for n in 0..MESSAGES {
                publisher.send(&n).await.unwrap();
            }
        });
        seen(100).await;
        group.scale_to(4).await.unwrap();
        assert_eq!(group.size().await, 4);
        seen(250).await;
        assert_eq!(group.members().await.len(), 4);
        let depth = group.depth().await.unwrap();
        assert_eq!(depth.members, 4);
        assert!(depth.consumers >= 4, "{depth:?}");
        group.set_prefetch(5).await.unwrap();
        seen(400).await;
        group.scale_to(1).await.unwrap();
        assert_eq!(group.size().await, 1);
        sender.await.unwrap();
        seen(MESSAGES as usize).await;
        group.close().await;
        let handled = handled.lock().unwrap().clone();
        assert_eq!(handled.len(), MESSAGES as usize, "lost none");
        let twice: Vec<_> = handled.iter().filter(|(_, c)| **c > 1).collect();
        assert!(twice.is_empty(), "handled twice: {twice:?}");
        assert!(group.scale_to(0).await.is_err());
        support::teardown(&mq, &q, &[]).await;
    })
    .await;
}

#[tokio::test]
async fn a_pipeline_step_is_scaled_while_it_runs() {
    on_each_target(|target: Broker| async move {
        let mq = Connection::connect(&target.url()).await.unwrap();
        let name = support::unique("pipe-scale");
        let done: Arc<Mutex<Vec<u32>>> = Arc::default();
        let d = done.clone();
        let p = mq
            .pipeline::<u32>(&name)
            .step("slow", |m: Message<u32>| async move {
                tokio::time::sleep(Duration::from_millis(5)).await;
                Ok(Some(*m.payload()))
            })
            .step("sink", move |m: Message<u32>| {
                let d = d.clone();
                async move {
                    d.lock().unwrap().push(*m.payload());
                    Ok(None::<()>)
                }
            })
            .build()
            .await
            .unwrap();
        for n in 0..100u32 {
            p.send(&n).await.unwrap();
        }
        p.step("slow").unwrap().scale_to(3).await.unwrap();
        assert_eq!(p.step("slow").unwrap().size().await, 3);
        eventually(WAIT, "every run completed", || async {
            (p.stats().completed == 100).then_some(())
        })
        .await;
        let mut got = done.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        p.close().await;
        for s in ["slow", "sink"] {
            support::delete_queues(&mq, &format!("{name}.{s}"), &[]).await;
        }
        let _ = mq.transport().delete_exchange(&name).await;
    })
    .await;
}
